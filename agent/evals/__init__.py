"""Answer-quality evals (GSM8K, BFCL simple) asked of a serving engine, and their comparison."""
