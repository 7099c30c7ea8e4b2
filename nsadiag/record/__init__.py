"""Typed records that several parts of nsadiag read: written once where they are measured,
parsed once at the disk boundary (each ``from_dict`` raises TypeError or ValueError naming
the field; nsadiag.rundir.parse_stored turns that into one RecordError line)."""
