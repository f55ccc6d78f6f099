"""The OpenAI API (completions, chat completions, embeddings, models) on the main REST port."""
