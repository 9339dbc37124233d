"""Reading and checking answers: numbers as written, final answers and hedges, the reward."""
