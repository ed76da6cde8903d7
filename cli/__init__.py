"""The ``taskq`` command line (installed as ``taskq.cli``): one module per noun.

Data flow: operator -> cli/*.py -> taskq.Client (client.py) -> Lua scripts -> Redis.
The CLI makes no Redis calls of its own.
"""
