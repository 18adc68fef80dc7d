// Placeholder; the bench driver is written below.
print("matchmaking-bench")
