"""The transport: length-prefixed protobuf frames over Unix sockets, with fd passing."""
