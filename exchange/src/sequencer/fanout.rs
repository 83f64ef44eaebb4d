//! Market data's fan-out (exchange-core's last stage): each committed
//! update of a book or trades feed is encoded once and handed to one
//! broadcast channel per feed, which every local gateway connection
//! subscribed to it reads at its own pace; a remote gateway gets the update
//! once down its link, for all of its connections subscribed to the feed.
//! The sequencer decides who subscribes and when an update is released
//! (after its commit); this type only keeps the feeds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use gpux_engine::InstrumentId;
use gpux_gateway::link::{ConnectionId, LinkSender, SharedFrame};
use gpux_gateway::wire::Down;
use gpux_protocol::Channel;
use tokio::sync::broadcast;

/// A feed: a channel of one instrument.
type Feed = (Channel, InstrumentId);

/// Every feed with at least one subscription so far, and the remote links
/// that carry each.
pub(super) struct FanOut {
    /// One broadcast channel per feed, for the local gateway's connections.
    feeds: HashMap<Feed, broadcast::Sender<Arc<SharedFrame>>>,
    /// Remote gateways' links subscribed to each feed, by link id, with the
    /// connections that subscribed through each: every update goes once
    /// down each link.
    links: HashMap<Feed, BTreeMap<u64, (LinkSender, BTreeSet<ConnectionId>)>>,
    /// Frames each feed buffers for its slowest subscriber.
    frames_max: usize,
}

impl FanOut {
    pub(super) fn new(frames_max: usize) -> FanOut {
        FanOut { feeds: HashMap::new(), links: HashMap::new(), frames_max: frames_max.max(1) }
    }

    /// Frames each feed created from now on buffers (at least 1).
    pub(super) fn set_frames_max(&mut self, frames: usize) {
        self.frames_max = frames.max(1);
    }

    /// A receiver of `feed` from now on for `connection`; one behind a
    /// remote gateway's `link` also has the link carry the feed.
    pub(super) fn join(
        &mut self,
        feed: Feed,
        connection: ConnectionId,
        link: Option<&LinkSender>,
    ) -> broadcast::Receiver<Arc<SharedFrame>> {
        if let Some(link) = link {
            let links = self.links.entry(feed).or_default();
            links.entry(link.id).or_insert_with(|| (link.clone(), BTreeSet::new())).1.insert(connection);
        }
        let capacity = self.frames_max;
        self.feeds.entry(feed).or_insert_with(|| broadcast::channel(capacity).0).subscribe()
    }

    /// `connection`, behind the link `link`, left `feed`: the link stops
    /// carrying it once none of its gateway's connections is subscribed.
    pub(super) fn leave_link(&mut self, feed: Feed, connection: ConnectionId, link: u64) {
        let Some(links) = self.links.get_mut(&feed) else { return };
        if let Some((_, subscribers)) = links.get_mut(&link) {
            subscribers.remove(&connection);
            if subscribers.is_empty() {
                links.remove(&link);
            }
        }
        if links.is_empty() {
            self.links.remove(&feed);
        }
    }

    /// Hands a committed update to every subscriber of `feed`: once down
    /// each link, once into the local channel.
    pub(super) fn publish(&self, feed: Feed, frame: Arc<SharedFrame>) {
        let (channel, instrument) = feed;
        if let Some(links) = self.links.get(&feed) {
            for (link, _) in links.values() {
                // A full link is closed by its server (the gateway
                // reconnects); nothing to do here.
                let _ = link.try_send(Down::Feed { channel, instrument, message: frame.message().clone() });
            }
        }
        if let Some(local) = self.feeds.get(&feed) {
            // No receiver left is fine: nobody is subscribed now.
            let _ = local.send(frame);
        }
    }
}
