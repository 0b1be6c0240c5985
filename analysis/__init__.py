"""Tables and figures built from the runs' files (never from literal numbers)."""
