"""The verifiers that score RL responses (math, ifeval, code and plug-ins) and the bounded call that
runs them (verifiers.py). The code verifier (code.py) runs each test as written in a process of its own
and the program in another, which holds only the program; every use of a program name from the tests
is a request over one narrow channel (data in and out, other objects as handles), and only the tests'
process says pass or fail. The processes run in the sandbox (code_sandbox.py, with its seccomp filter
code_seccomp.py and, where the host delegates one, a memory cgroup, code_cgroup.py). docs/rewards.md,
docs/rewards-code.md, docs/rewards-code-sandbox.md.

May import: olmax.config, olmax.extras, olmax.errors. Never the model, objectives or step.
"""
