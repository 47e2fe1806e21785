"""A tool-calling LLM agent on flowy, against any OpenAI-compatible endpoint
(docs/llm-agent.md).

``chat.py`` is the streaming chat-completions client, ``agent.py`` the graph and the
command line, ``stub.py`` a local stand-in for a model that serves a script.
"""
