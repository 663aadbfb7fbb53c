"""`specchat write`: books of 100K tokens, written with a drafter and kept on disk as they grow.

- `settings.py`: what a book's text is a function of (what a resume must keep);
- `book.py`: the text, ids and state files, consistent whenever the process dies;
- `write.py`: the loop over the engine's steps, the window policy, resume by replay, the report;
- `diversity.py`: distinct-n.
"""
