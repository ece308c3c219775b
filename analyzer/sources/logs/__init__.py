"""dstack server log readers (rich, standard, json; plain, docker-timestamped or journald)."""
