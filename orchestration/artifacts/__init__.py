"""The artifact store: content-addressed blobs behind one interface, with an embedded (directory)
backend and an S3-compatible one, and the signed URLs agents use to read and write them."""
