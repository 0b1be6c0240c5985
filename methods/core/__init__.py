"""Shared machinery of every method: policy, rollouts, the loop, the ledger."""
