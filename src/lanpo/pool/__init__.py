"""The experience pool: the SQLite store, export and import, the BM25 index, retrieval with relevance."""
