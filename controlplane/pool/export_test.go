package pool

// QueuedClaims is how many claims wait to be taken into a batch, so a
// test can form a batch of its own size.
func QueuedClaims(s *Service) int {
	b := s.claims()
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, q := range b.queues {
		n += len(q)
	}
	return n
}
