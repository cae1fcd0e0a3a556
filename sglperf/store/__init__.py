"""What a run leaves behind: the typed run document and its only writer, baselines and history."""
