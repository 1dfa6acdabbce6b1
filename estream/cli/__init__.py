"""The ``estream`` command (:mod:`main` dispatches): server processes, ``estream up`` and
the user commands over the SDK (:mod:`user` parses; one module per group: :mod:`streams`,
:mod:`records`, :mod:`cluster`, :mod:`bench`; :mod:`output` renders tables or JSON).
"""
