package session

import (
	"sync"

	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// updateQueue holds task updates until the stream can take them. While the
// agent is cut off, updates pile up; the queue keeps it bounded by
// coalescing per task: a task's lease renewals (RUNNING) replace one
// another, and a final status replaces them all. The first RUNNING of a
// task, which acknowledges its lease, is kept until it has been sent, so
// the control plane always sees RUNNING before the outcome.
type updateQueue struct {
	mu      sync.Mutex
	max     int
	order   []string
	pending map[string]*pendingTask
	// acked holds tasks whose first RUNNING went out; entries go when the
	// task's final update does.
	acked   map[string]bool
	dropped int
	ready   chan struct{}
}

type pendingTask struct {
	ack    *item
	latest *item
	// sent is called once the final update has been handed to the stream.
	sent func()
}

// item is one queued update. Each push makes a new item, so an update
// pushed again while its earlier copy is being sent is not mistaken for
// the copy and dropped when the send completes.
type item struct {
	u *tetherv1.TaskUpdate
}

func newUpdateQueue(max int) *updateQueue {
	return &updateQueue{max: max, pending: map[string]*pendingTask{}, acked: map[string]bool{}, ready: make(chan struct{}, 1)}
}

func terminal(s tetherv1.TaskStatus) bool {
	return s == tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED || s == tetherv1.TaskStatus_TASK_STATUS_FAILED || s == tetherv1.TaskStatus_TASK_STATUS_CANCELLED
}

// push queues u. onSent, if not nil, runs after u has been sent. It
// returns how many queued updates had to be dropped to make room.
func (q *updateQueue) push(u *tetherv1.TaskUpdate, onSent func()) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pushLocked(u, onSent)
}

func (q *updateQueue) pushLocked(u *tetherv1.TaskUpdate, onSent func()) int {
	dropped := 0
	p, ok := q.pending[u.TaskId]
	if !ok {
		for len(q.order) >= q.max {
			q.evict()
			dropped++
		}
		p = &pendingTask{}
		q.pending[u.TaskId] = p
		q.order = append(q.order, u.TaskId)
	}
	if u.Status == tetherv1.TaskStatus_TASK_STATUS_RUNNING && !q.acked[u.TaskId] && p.ack == nil {
		p.ack = &item{u: u}
	} else {
		p.latest = &item{u: u}
	}
	if onSent != nil {
		p.sent = onSent
	}
	q.dropped += dropped
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return dropped
}

// requeue puts back an update that was sent on a stream that broke before
// the control plane confirmed it, unless something newer for the task is
// already queued.
func (q *updateQueue) requeue(u *tetherv1.TaskUpdate) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, queued := q.pending[u.TaskId]; !queued {
		q.pushLocked(u, nil)
	}
}

// evict drops the oldest task that only has lease renewals queued (a lost
// renewal costs at most a re-lease); failing that, the oldest task.
func (q *updateQueue) evict() {
	victim := 0
	for i, id := range q.order {
		p := q.pending[id]
		if p.latest == nil || !terminal(p.latest.u.Status) {
			victim = i
			break
		}
	}
	id := q.order[victim]
	q.order = append(q.order[:victim], q.order[victim+1:]...)
	delete(q.pending, id)
}

// next returns the next update to send, without removing it.
func (q *updateQueue) next() *item {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.order) == 0 {
		return nil
	}
	p := q.pending[q.order[0]]
	if p.ack != nil {
		return p.ack
	}
	return p.latest
}

// done removes it after a successful send and returns the task's
// callback, if it was the task's final update. An item replaced while it
// was being sent leaves its replacement queued.
func (q *updateQueue) done(it *item) func() {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := it.u
	p, ok := q.pending[u.TaskId]
	if !ok {
		return nil
	}
	switch it {
	case p.ack:
		p.ack = nil
		q.acked[u.TaskId] = true
	case p.latest:
		p.latest = nil
	default:
		return nil
	}
	if p.ack != nil || p.latest != nil {
		return nil
	}
	for i, id := range q.order {
		if id == u.TaskId {
			q.order = append(q.order[:i], q.order[i+1:]...)
			break
		}
	}
	delete(q.pending, u.TaskId)
	if terminal(u.Status) {
		delete(q.acked, u.TaskId)
		return p.sent
	}
	return nil
}

func (q *updateQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order)
}
