"""hedgerow.controller.report.report: the weekly cost/latency report: its figures, its four formats, its
charts, reading it from the store, and the scheduled delivery.
"""
