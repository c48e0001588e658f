"""The verifiers that score RL responses (math, ifeval, code and plug-ins) and the bounded call that
runs them (verifiers.py); the code verifier's sandbox (code.py, code_sandbox.py). docs/rewards.md.

May import: olmax.config, olmax.extras, olmax.errors; never the model or training code.
"""
