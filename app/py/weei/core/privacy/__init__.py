"""Privacy of participants' updates: client-level differential privacy (dp_*) and secure aggregation."""
