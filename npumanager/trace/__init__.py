"""Traces of what npud and its drivers did: record (:mod:`.recorder`), Chrome trace-event
JSON that Perfetto's UI opens (:mod:`.chrome`), a timeline picture (:mod:`.timeline`)."""
