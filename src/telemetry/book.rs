//! The bounded books behind the coordinator's gauges, shared by the
//! metrics and the pacing gauges: apart from both, so neither imports the
//! other for it.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher as _, Hash};
use std::sync::Mutex;

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain maps of numbers: still usable after a panic elsewhere.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A bounded book behind a gauge: entries found by their key's hash alone,
/// the key itself kept beside the value only for the gauges that show it.
/// A call finds its entry without comparing a string, each a pointer away
/// from the table (a Lease compared both names of its scope), and never
/// copies a key the book already holds.
///
/// The hash is SipHash under this process's random keys, so no peer can
/// choose names that collide; two keys colliding in 64 bits (odds about
/// 2⁻³² with a book full) would share one entry of the gauge. The map
/// itself hashes these uniform `u64`s with foldhash.
pub(super) struct Book<K, V> {
    hash: RandomState,
    entries: HashMap<u64, (K, V), foldhash::fast::RandomState>,
}

impl<K, V> Default for Book<K, V> {
    fn default() -> Self {
        Book {
            hash: RandomState::new(),
            entries: HashMap::default(),
        }
    }
}

impl<K, V> Book<K, V> {
    /// Sets `key`'s value; the key is kept (made by `own`) only when new,
    /// and a new key is not tracked once the book holds `max` entries.
    pub(super) fn set<Q: Hash + ?Sized>(
        &mut self,
        key: &Q,
        own: impl FnOnce() -> K,
        value: V,
        max: usize,
    ) {
        let at = self.hash.hash_one(key);
        if let Some((_, entry)) = self.entries.get_mut(&at) {
            *entry = value;
        } else if self.entries.len() < max {
            self.entries.insert(at, (own(), value));
        }
    }

    /// Keeps the entries `keep` says to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        self.entries.retain(|_, (key, value)| keep(key, value));
    }

    /// Every entry, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.values().map(|(key, value)| (key, value))
    }
}
