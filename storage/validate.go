package storage

import "fmt"

// Validate methods: the request-level checks of every Store method, one
// per Params struct, so each backend (and any front end that wants to fail
// early) applies the same rules with the same messages. They do not check
// what is per item (Limits.ValidateItem rejects only its item) or needs
// the store's state (Limits.CheckNewQueue).

// Validate checks the queue name and the batch size.
func (p EnqueueParams) Validate(l Limits) error {
	if err := l.ValidateQueueName(p.Queue); err != nil {
		return err
	}
	return l.ValidateBatch(len(p.Items))
}

// Validate checks the queue name, Max (1..MaxBatch) and the lease (0: the
// queue's default).
func (p PollParams) Validate(l Limits) error {
	if err := l.ValidateQueueName(p.Queue); err != nil {
		return err
	}
	if err := l.validateLimit("max", p.Max); err != nil {
		return err
	}
	return l.ValidateLease(p.Lease)
}

// Validate checks the queue name and the number of ids.
func (p AckParams) Validate(l Limits) error {
	if err := l.ValidateQueueName(p.Queue); err != nil {
		return err
	}
	return l.ValidateBatch(len(p.IDs))
}

// Validate checks the queue name, the number of ids and the delay when set
// (none but zero for undelivered items).
func (p NackParams) Validate(l Limits) error {
	if err := l.ValidateQueueName(p.Queue); err != nil {
		return err
	}
	if err := l.ValidateBatch(len(p.IDs)); err != nil {
		return err
	}
	if p.Undelivered && p.Delay != nil && *p.Delay != 0 {
		return fmt.Errorf("%w: undelivered items are ready again at once: delay %v", ErrInvalidArgument, *p.Delay)
	}
	if p.Delay != nil {
		return l.ValidateDelay(*p.Delay)
	}
	return nil
}

// Validate checks the queue name and the new lease duration.
func (p ExtendParams) Validate(l Limits) error {
	if err := l.ValidateQueueName(p.Queue); err != nil {
		return err
	}
	return l.ValidateLease(p.Duration)
}

// Validate checks the queue name unless it is "" (all queues).
func (p StatsParams) Validate(l Limits) error {
	if p.Queue == "" {
		return nil
	}
	return l.ValidateQueueName(p.Queue)
}

// Validate checks the queue name and Limit (1..MaxBatch).
func (p PeekParams) Validate(l Limits) error {
	if err := l.ValidateQueueName(p.Queue); err != nil {
		return err
	}
	return l.validateLimit("limit", p.Limit)
}

// Validate checks the queue name.
func (p PurgeParams) Validate(l Limits) error { return l.ValidateQueueName(p.Queue) }

// Validate checks the queue name.
func (p DeleteQueueParams) Validate(l Limits) error { return l.ValidateQueueName(p.Queue) }

// Validate checks the queue name and Limit (1..MaxBatch).
func (p DeadListParams) Validate(l Limits) error {
	if err := l.ValidateQueueName(p.Queue); err != nil {
		return err
	}
	return l.validateLimit("limit", p.Limit)
}

// Validate checks the queue name and the number of ids, or Limit
// (1..MaxBatch) when there are none.
func (p RedriveParams) Validate(l Limits) error {
	if err := l.ValidateQueueName(p.Queue); err != nil {
		return err
	}
	if len(p.IDs) > 0 {
		return l.ValidateBatch(len(p.IDs))
	}
	return l.validateLimit("limit", p.Limit)
}

// validateLimit checks a count of items asked for (poll's max, a page's
// limit): 1..MaxBatch.
func (l Limits) validateLimit(name string, n int) error {
	if n < 1 || n > l.MaxBatch {
		return fmt.Errorf("%w: %s must be 1-%d, got %d", ErrInvalidArgument, name, l.MaxBatch, n)
	}
	return nil
}
