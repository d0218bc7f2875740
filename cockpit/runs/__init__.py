"""What a run is and what is known of it: the layout it is launched from (launch profiles in YAML),
the run itself (identity, scope, launch marker), the argument list a flag-set choice makes, and the
JSONL ledger of launches, outcomes and stops."""
