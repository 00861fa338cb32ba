"""Tests of hedgerow.controller.policy (mirrors controller/policy/)."""
