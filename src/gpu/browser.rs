//! Subgroups in browsers, which wgpu's WebGPU backend does not offer: its feature table (wgpu
//! 30) has no row for WebGPU's `subgroups`, so it never asks a browser's adapter for them and
//! never reports them, although Chrome has them (SwiftShader too) and the WGSL, subgroup
//! builtins and all, reaches the browser as written (`enable subgroups;` from `pipeline`).
//!
//! So the request is made one level down: before wgpu asks for an adapter, `ask_for_subgroups`
//! wraps `navigator.gpu.requestAdapter` so that every adapter it returns asks for `subgroups`
//! in `requestDevice` when it has them, and records what it was granted (with the adapter's
//! subgroup sizes); `granted_subgroups` then tells `Gpu` what wgpu's device does not say.
//! Only JavaScript built-ins are called (no `eval`, no JS file of our own), so a page's
//! content security policy and the npm package are unaffected.

#[cfg(target_arch = "wasm32")]
mod imp {
    use std::cell::Cell;

    use js_sys::{Array, Function, Object, Promise, Reflect};
    use wasm_bindgen::closure::Closure;
    use wasm_bindgen::{JsCast, JsValue};

    /// Marks a `navigator.gpu` whose `requestAdapter` is already wrapped.
    const WRAPPED: &str = "__webshardSubgroups";

    thread_local! {
        /// The subgroup sizes of the last device granted `subgroups`, taken by `granted`.
        static GRANTED: Cell<Option<(u32, u32)>> = const { Cell::new(None) };
    }

    /// Wraps `navigator.gpu.requestAdapter` once per global (page or worker). Anything
    /// missing (no WebGPU) leaves it alone: wgpu then reports that itself.
    pub fn ask_for_subgroups() {
        let _ = try_wrap();
    }

    fn try_wrap() -> Result<(), JsValue> {
        let navigator = Reflect::get(&js_sys::global(), &"navigator".into())?;
        let gpu = Reflect::get(&navigator, &"gpu".into())?;
        if !gpu.is_object() || Reflect::has(&gpu, &WRAPPED.into())? {
            return Ok(());
        }
        let original: Function = Reflect::get(&gpu, &"requestAdapter".into())?.dyn_into()?;
        let target = gpu.clone();
        let wrapper = Closure::<dyn FnMut(JsValue) -> Result<Promise, JsValue>>::new(
            move |options: JsValue| {
                let adapter: Promise = original.call1(&target, &options)?.dyn_into()?;
                let patch = Closure::once_into_js(|adapter: JsValue| {
                    let _ = patch_adapter(&adapter);
                    adapter
                });
                then(&adapter, &patch)
            },
        );
        Reflect::set(&gpu, &"requestAdapter".into(), wrapper.as_ref())?;
        Reflect::set(&gpu, &WRAPPED.into(), &JsValue::TRUE)?;
        // Lives as long as the global: navigator.gpu keeps calling it.
        wrapper.forget();
        Ok(())
    }

    /// Gives `adapter` (when it has subgroups) a `requestDevice` that asks for them too.
    fn patch_adapter(adapter: &JsValue) -> Result<(), JsValue> {
        if !adapter.is_object() || !has_feature(adapter, "subgroups")? {
            return Ok(());
        }
        let original: Function = Reflect::get(adapter, &"requestDevice".into())?.dyn_into()?;
        let sizes = subgroup_sizes(adapter);
        let target = adapter.clone();
        let request = Closure::<dyn FnMut(JsValue) -> Result<Promise, JsValue>>::new(
            move |descriptor: JsValue| {
                let device: Promise = original
                    .call1(&target, &with_subgroups(&descriptor)?)?
                    .dyn_into()?;
                let record = Closure::once_into_js(move |device: JsValue| {
                    if has_feature(&device, "subgroups").unwrap_or(false) {
                        GRANTED.with(|granted| granted.set(Some(sizes)));
                    }
                    device
                });
                then(&device, &record)
            },
        );
        Reflect::set(adapter, &"requestDevice".into(), request.as_ref())?;
        // An adapter makes one device; the closure goes with it.
        request.forget();
        Ok(())
    }

    /// `promise.then(callback)`, whose promise resolves to what `callback` returns (js-sys's
    /// `then` takes callbacks that return nothing).
    fn then(promise: &Promise, callback: &JsValue) -> Result<Promise, JsValue> {
        let then: Function = Reflect::get(promise, &"then".into())?.dyn_into()?;
        then.call1(promise, callback)?.dyn_into()
    }

    /// A copy of `descriptor` whose `requiredFeatures` include `subgroups`.
    fn with_subgroups(descriptor: &JsValue) -> Result<JsValue, JsValue> {
        let copy = Object::new();
        if descriptor.is_object() {
            Object::assign(&copy, descriptor.unchecked_ref());
        }
        let features = Reflect::get(&copy, &"requiredFeatures".into())?;
        let features = match features.is_undefined() {
            true => Array::new(),
            false => Array::from(&features),
        };
        if !features.includes(&"subgroups".into(), 0) {
            features.push(&"subgroups".into());
        }
        Reflect::set(&copy, &"requiredFeatures".into(), &features)?;
        Ok(copy.into())
    }

    fn has_feature(owner: &JsValue, name: &str) -> Result<bool, JsValue> {
        let features = Reflect::get(owner, &"features".into())?;
        let has: Function = Reflect::get(&features, &"has".into())?.dyn_into()?;
        Ok(has.call1(&features, &name.into())?.is_truthy())
    }

    /// `adapter.info`'s subgroup sizes (Chrome 134 on); 0 where it does not say.
    fn subgroup_sizes(adapter: &JsValue) -> (u32, u32) {
        let info = Reflect::get(adapter, &"info".into()).unwrap_or_default();
        let size = |name: &str| {
            Reflect::get(&info, &name.into())
                .ok()
                .and_then(|v| v.as_f64())
                .map_or(0, |v| v as u32)
        };
        (size("subgroupMinSize"), size("subgroupMaxSize"))
    }

    /// The subgroup sizes of the device just granted `subgroups`, once; `None` if it was not.
    pub fn granted_subgroups() -> Option<(u32, u32)> {
        GRANTED.with(Cell::take)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    /// Native backends ask wgpu itself.
    pub fn ask_for_subgroups() {}

    pub fn granted_subgroups() -> Option<(u32, u32)> {
        None
    }
}

pub use imp::{ask_for_subgroups, granted_subgroups};
