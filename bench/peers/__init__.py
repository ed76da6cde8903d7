"""Peer queues taskq is measured against (rq in Python, BullMQ in Node)."""
