"""The guard as a service: the decision (`guard`), the live model of the server (`model`) and
its HTTP face under uvicorn (`http`)."""
