package fdbmodel

import "math/rand/v2"

// maxLevel bounds the skip list height; 2^24 keys is far beyond any test.
const maxLevel = 24

// version is one MVCC version of a key: the value written at commit
// version v, or a tombstone.
type version struct {
	v   int64
	val []byte
	del bool
}

// node is a key with its versions, oldest first.
type node struct {
	key  string
	vers []version
	next []*node
}

// at returns the value visible at read version rv, and whether the key
// exists there.
func (n *node) at(rv int64) ([]byte, bool) {
	for i := len(n.vers) - 1; i >= 0; i-- {
		if n.vers[i].v <= rv {
			if n.vers[i].del {
				return nil, false
			}
			return n.vers[i].val, true
		}
	}
	return nil, false
}

// latest returns the newest value of the key.
func (n *node) latest() ([]byte, bool) {
	if len(n.vers) == 0 {
		return nil, false
	}
	last := n.vers[len(n.vers)-1]
	return last.val, !last.del
}

// skiplist is an ordered map from key to node. It is not safe for
// concurrent use (the DB mutex guards it). A skip list keeps inserts and
// deletes O(log n) where a sorted slice would copy megabytes per insert at
// the 100k-item scale of the multi-node test.
type skiplist struct {
	head  node
	level int
	len   int
	rng   *rand.Rand
}

func newSkiplist(seed uint64) *skiplist {
	s := &skiplist{level: 1, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))}
	s.head.next = make([]*node, maxLevel)
	return s
}

func (s *skiplist) randomLevel() int {
	l := 1
	for l < maxLevel && s.rng.Uint32()&3 == 0 {
		l++
	}
	return l
}

// seekGE returns the first node with key >= k, or nil.
func (s *skiplist) seekGE(k string) *node {
	x := &s.head
	for i := s.level - 1; i >= 0; i-- {
		for x.next[i] != nil && x.next[i].key < k {
			x = x.next[i]
		}
	}
	return x.next[0]
}

// get returns the node for k, or nil.
func (s *skiplist) get(k string) *node {
	n := s.seekGE(k)
	if n != nil && n.key == k {
		return n
	}
	return nil
}

// getOrInsert returns the node for k, creating it.
func (s *skiplist) getOrInsert(k string) *node {
	var update [maxLevel]*node
	x := &s.head
	for i := s.level - 1; i >= 0; i-- {
		for x.next[i] != nil && x.next[i].key < k {
			x = x.next[i]
		}
		update[i] = x
	}
	if n := x.next[0]; n != nil && n.key == k {
		return n
	}
	lvl := s.randomLevel()
	if lvl > s.level {
		for i := s.level; i < lvl; i++ {
			update[i] = &s.head
		}
		s.level = lvl
	}
	n := &node{key: k, next: make([]*node, lvl)}
	for i := 0; i < lvl; i++ {
		n.next[i] = update[i].next[i]
		update[i].next[i] = n
	}
	s.len++
	return n
}

// remove deletes the node for k if present.
func (s *skiplist) remove(k string) {
	var update [maxLevel]*node
	x := &s.head
	for i := s.level - 1; i >= 0; i-- {
		for x.next[i] != nil && x.next[i].key < k {
			x = x.next[i]
		}
		update[i] = x
	}
	n := x.next[0]
	if n == nil || n.key != k {
		return
	}
	for i := 0; i < len(n.next); i++ {
		if update[i].next[i] == n {
			update[i].next[i] = n.next[i]
		}
	}
	for s.level > 1 && s.head.next[s.level-1] == nil {
		s.level--
	}
	s.len--
}
