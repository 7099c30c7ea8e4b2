"""Automatic triage: pure decisions (``decide``) and the engine that runs the stages
(``engine``); ``nsadiag.commands.triage`` is the command around them."""
