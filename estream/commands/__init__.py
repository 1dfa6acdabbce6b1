"""The user commands of the ``estream`` CLI, one module per group, all over the SDK.

:mod:`output` renders tables and JSON, :mod:`streams` is ``estream stream ...``,
:mod:`records` is ``estream append`` and ``estream read``, :mod:`cluster` is
``estream cluster status``, :mod:`bench` is ``estream bench``. :mod:`estream.usercli`
parses the command line and maps errors to exit codes.
"""
