"""The wire contract between Kairos's services and with its users: subjects, streams, buckets, messages.

Defined once here and imported by every service; nothing else names a subject or shapes a payload.
"""
