"""What only server processes (and the commands that start them) share: durable small
files (:mod:`durable`) and settings layering flag > ``ESTREAM_*`` env > TOML (:mod:`config`).
"""
