"""The AI judge: model endpoints, sampling completions, judge runs on answers and on steps, and revisions."""
