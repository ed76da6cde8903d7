"""Administration: the Client, job handles (plain and sharded), checkpoints, stats."""
