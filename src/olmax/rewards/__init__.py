"""The verifiers that score RL responses (math, ifeval, code and plug-ins) and the bounded call that
runs them (verifiers.py). The code verifier (code.py) splits each test into the calls into the program
and the verdict (code_tests.py), runs the program in its sandbox (code_sandbox.py, with its seccomp filter
code_seccomp.py and, where the host delegates one, a memory cgroup, code_cgroup.py), which returns only
the calls' values (code_values.py, code_records.py), and judges them in the verifier's own process.
docs/rewards.md.

May import: olmax.config, olmax.extras, olmax.errors. Never the model, objectives or step.
"""
