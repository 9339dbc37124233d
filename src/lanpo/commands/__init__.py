"""The bodies of `lanpo train`, `lanpo sft` and `lanpo sft-data`."""
