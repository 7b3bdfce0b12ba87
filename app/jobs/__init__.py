"""Jobs domain: submission, state transitions, transcripts and their formats."""
