"""`lanpo report` (one self-contained HTML page) and `lanpo compare`."""
