"""`specchat chat`: a Textual app that streams answers with every token coloured by who produced it.

The engine runs in a worker thread and knows nothing of the UI; the app only consumes its `StepEvent`s.
"""
