"""The engine: the Redis connection, the Lua library's build and its transport."""
