"""Operations: the reaper, the connection watch, the exporter, ACL rules."""
