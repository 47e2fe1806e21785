"""An expense approval app on flowy: the guide's example (docs/first-app.md).

``graph.py`` is the agent, ``web.py`` the Starlette app, ``worker.py`` the background
worker that pays approved requests.
"""
