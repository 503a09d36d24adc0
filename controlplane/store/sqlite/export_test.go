package sqlite

// OnQueued sets the hook that hears of every transaction joining the
// group commit queue.
func (s *Store) OnQueued(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queued = f
}
