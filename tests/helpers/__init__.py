"""Helpers of the tests: the leakage audit, a headless browser, and the scripts tests launch as processes."""
