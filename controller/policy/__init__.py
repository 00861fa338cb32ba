"""hedgerow.controller.policy.policy: TTFT estimation and the threshold policy, pure (no I/O, no clock): the
sample rule, Kaplan-Meier curves, the hedge model, the window and drift rules, the policy rules.
"""
