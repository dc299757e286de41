"""Rules applied to each caller and each server: who sees and calls what (`access`), pins of tool
definitions, egress rules, rate limits and retry backoff."""
