"""`specchat serve`: the OpenAI HTTP API over one engine, so every OpenAI client gets exact speculative decoding.

`requests.py` checks a request body, `worker.py` runs the engine on its own thread behind a bounded FIFO queue,
`responses.py` shapes what goes back, `app.py` routes HTTP to them, `server.py` runs it under uvicorn.
"""
