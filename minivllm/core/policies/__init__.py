"""The scheduling policies, one class per file on the interface of base.py; core/policy.py
registers them by name."""
