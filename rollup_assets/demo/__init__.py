"""`rollups demo`: the whole product in one run (see `story`)."""
