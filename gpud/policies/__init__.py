"""Built-in scheduling policies: ordinary gpud plugins the policy file can switch off."""
