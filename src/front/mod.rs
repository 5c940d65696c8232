//! The front door: one way to ask a model for text, whatever runs it. The single-device
//! `Engine` and the fleet `Coordinator` both implement `Generator`; the runner, the pages and
//! the HTTP API drive it with one request type (`GenerateRequest`: a prompt as text, ids or
//! chat messages, with `GenerateOptions`), one streaming event (`TokenEvent`, whose callback
//! can cancel its request at any token) and one result (`Generated`: ids, text, finish
//! reason, usage with cached prefix tokens, timings). `TextFront` is the text side they
//! share: tokenizer, chat template, and per request the sampler and stop rules (`Decoding`).
//!
//! The trait is async and asks for no `Send`, so it runs under any executor, wasm included.
//! A multi-threaded server keeps a generator on one thread of its own (GPU work is serial
//! anyway), sends the events out through a channel and cancels a request by returning
//! `ControlFlow::Break` once the channel's receiver is gone.

mod request;
mod text;

pub use request::{
    FinishReason, GenerateOptions, GenerateRequest, Generated, OnEvent, Prompt, RequestError,
    Timings, TokenEvent, TokenLogprobs, Usage,
};
pub use text::{check_ids, Decoding, TextFront};

/// Something that generates: the single device or a fleet.
#[async_trait::async_trait(?Send)]
pub trait Generator {
    /// Everything else that can go wrong (device, network, donors).
    type Error: std::error::Error + From<RequestError> + 'static;

    /// The tokenizer and chat template: how prompts become ids and ids text.
    fn text(&self) -> &TextFront;

    /// Ids the model knows: every prompt id is below this.
    fn vocab(&self) -> u32;

    /// Most positions (prompt and completion) one request can use.
    fn max_context(&self) -> u32;

    /// Runs every request (as many at once as the generator can) and returns their results in
    /// order. `on_event` gets each token as it is accepted, tagged with its request's index.
    async fn generate(
        &mut self,
        requests: &[GenerateRequest],
        on_event: &mut OnEvent<'_>,
    ) -> Result<Vec<Generated>, Self::Error>;

    /// The ids a request's prompt becomes, checked: what an API validates before queueing.
    fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, RequestError> {
        self.text().prompt_ids(prompt, self.vocab())
    }

    /// `generate` for one request.
    async fn generate_one(
        &mut self,
        request: &GenerateRequest,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Generated, Self::Error> {
        let mut results = self
            .generate(std::slice::from_ref(request), on_event)
            .await?;
        Ok(results.pop().unwrap_or_default())
    }
}
