"""Text-to-SQL pipeline: SQL safety checks, database access, prompts and the agentic workflow."""
