"""Stand-ins for the parts of a cluster a test or a benchmark cannot have for real (many GPU hosts)."""
