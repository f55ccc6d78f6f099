"""Low-level telemetry: counters and histograms, trace spans, structured logs; nothing here reads the registry."""
