"""Tests of hedgerow.controller.store (mirrors controller/store/)."""
