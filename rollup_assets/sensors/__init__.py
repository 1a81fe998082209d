"""Change detection, drain and forward planning (pure planners over snapshots), and the two
sensors that run them (`rollup_assets.sensors.definitions`)."""
